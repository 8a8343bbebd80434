"""The launcher: the process tree around training. From the pod contract to
training processes (launch), the elastic agent's workers forked from a warm
forkserver (forkserver, worker), a lost peer's quick new round (lost_peer),
the kept logs (logtee) and the workers' process names (procname). Above the
training loop and every training part; ``torchfleet_trainer.main`` starts it."""
