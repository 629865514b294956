"""The runtime: the engine file, and (later) the Engine, its execution contexts and runners."""
