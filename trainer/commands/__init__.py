"""The top: the console scripts and the API a user calls (the stage-1 and stage-2 commands,
``launch``, the stage-1 then stage-2 pipeline), the oracle job and its report, the
quality-diversity frontier, and the offline text example.
"""
