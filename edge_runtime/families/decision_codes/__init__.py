"""The decision-codes family: a causal LM read at one position through a code readout
(causal and state-once).
"""
