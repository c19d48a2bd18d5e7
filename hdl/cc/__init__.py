"""Congestion control and QoS: CNP notification point, per-QP reaction point (DCQCN, FlowMatrix),
TX scheduler with token-bucket pacers, tenant buckets and traffic classes."""
