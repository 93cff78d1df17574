"""Training-level features on top of the collectives: PowerSGD, local SGD, load balancing,
the gradients of the collectives."""
