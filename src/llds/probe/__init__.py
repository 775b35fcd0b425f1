"""Measurements that run the model beyond the training pass: the one-step probe (the paper's
Eq. 3; its update plain SGD or the training optimizer's step, `update`) and fixed reference
chains."""
