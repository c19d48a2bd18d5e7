"""Control bridges: carry the host driver's register accesses to the CSR bank on boards without PCIe."""
