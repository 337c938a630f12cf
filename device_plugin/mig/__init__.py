"""MIG in the device plugin: NVML access, the owned instances, their reconciliation, Allocate."""
