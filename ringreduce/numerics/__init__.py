"""The numbers on the wire: reductions and scaling, the kernels, array checks, narrow-float compression."""
