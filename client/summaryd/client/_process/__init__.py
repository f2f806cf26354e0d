"""The client at the edges of a process's life: fork (`_fork`), interpreter exit and SIGTERM, and the courier
that delivers what forked children logged (`_courier`).

The fork layer is a leaf: the senders and the courier register with it, it imports neither.
"""
