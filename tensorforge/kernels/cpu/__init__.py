"""CPU kernels of our own in C++, compiled once per machine with the host's compiler (`extension.load`) and cached:
layers where the vendor path through torch pays a fixed cost per op that outweighs the work (squeeze-and-excitation
as one call instead of seven)."""
