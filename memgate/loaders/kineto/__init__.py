"""The Kineto family: torch.profiler's Chrome traces (:mod:`~memgate.loaders.kineto.kineto`, over the events
:mod:`~memgate.loaders.kineto.kineto_events` keeps) and ``export_memory_timeline``'s files
(:mod:`~memgate.loaders.kineto.memory_timeline`)."""
