"""The end-to-end comparison on an emulated heterogeneous cluster (`hetpp demo`, `bench/e2e.py`).

`emulated`: the built-in cluster and the CPU profile scaled per emulated GPU type (torch only
inside `profile_cpu`). `compare`: plan every strategy, simulate, train, set predicted beside
measured. `runs`: one `hetpp train --emulate` run and its measurements. `report`: tables and
charts. `tour`: the `hetpp demo` command's flow.
"""
