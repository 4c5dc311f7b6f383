"""Recovery inside one Slurm allocation: the leader's scheduler over the allocation's
nodes (cluster.py), each node's agent (agent.py) and their protocol (wire.py);
decisions 0510, 0511."""
