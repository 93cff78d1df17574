"""Training-level features on top of the collectives: PowerSGD, local SGD, load balancing, gradient rules."""
