"""The gradient tensors of ResNet-50 (torchvision's layout): 161 tensors, 25,557,032 parameters."""


def gradient_shapes():
    """Shapes in the order the forward pass creates them; a backward pass produces them reversed."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            shapes += [(width, channels, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if block == 0:
                shapes += [(4 * width, channels, 1, 1), (4 * width,), (4 * width,)]
            channels = 4 * width
    return shapes + [(1000, 2048), (1000,)]
