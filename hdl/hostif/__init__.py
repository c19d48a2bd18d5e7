"""The host interface: queues in host memory (send, receive, completion rings), doorbells,
interrupts, and the PCIe adapter that puts the core behind a PCIe hard block."""
