"""The engine builder: build configuration, optimization profiles, the memory planner."""
