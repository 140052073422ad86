"""Cost model (pure numpy, no torch): compute, memory, communication, pipeline and step time."""
