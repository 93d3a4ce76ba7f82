"""Labs: simulated slice hosts on this machine for the demo, tests and benchmarks.

Everything a lab creates is uniquely named and torn down by the lab (network namespaces,
daemons stopped by pid, loop devices, private mount namespaces); nothing existing on the
machine is touched.
"""
