"""Ethernet MACs for the board tops: GMII/RGMII 1 GbE with FCS, padding and clock-domain crossing."""
