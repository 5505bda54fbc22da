"""How the matcher declines a Softmax: not attention at all, or attention it cannot fuse."""


class NotAttention(Exception):
    """This Softmax is not an attention softmax."""


class OverWeights(NotAttention):
    """The Softmax normalises over an axis that a weight gives (a classifier head's classes, a router's
    experts), not over positions of the input: never attention, never listed."""


class Unsupported(Exception):
    """This Softmax is an attention softmax but something around it cannot be fused."""


# A Where fill at or below this masks a logit out (finfo(float16).min is -65504).
MASKED_FILL = -1.0e4
