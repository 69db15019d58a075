"""High availability: the lease that says which driver may run a network, and fences a former one."""
