"""The sparrow family: the sparrow-decider static tier (bag-of-words pooling + MLP) on /v1/decisions.
"""
