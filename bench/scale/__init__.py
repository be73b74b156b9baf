"""The scale benchmark (`python -m bench.scale`, its command line in __main__): the system under
test and what is measured on it (system), ext_proc asked as Envoy asks it (decisions) and its
10 ms probe process (probe), health-only engines (engines), a replica's readings (measure),
binding stores in this process for etcd's write rates (etcd_writes), the result table (report).
"""
