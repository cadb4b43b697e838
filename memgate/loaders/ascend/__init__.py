"""The Ascend family: torch_npu's and MindSpore's profiler output, CANN ``PROF_*`` folders and the Ascend
``.db`` exports, with what their files share (:mod:`~memgate.loaders.ascend.crossfile`: do a folder's files
belong together; :mod:`~memgate.loaders.ascend.trace_view`: the Chrome trace they write)."""
