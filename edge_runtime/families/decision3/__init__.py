"""Decision 3.0 (d3): upstream d3 code-readout packages converted to a hybrid recurrent/attention text core."""
