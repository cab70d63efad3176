"""The safety layer: every collective the run makes and what keeps them from hanging. The
process group and its start-up (:mod:`~trainer.distributed.world`), agreed decisions and
gathering (:mod:`~trainer.distributed.collectives`), the peers' watch and the watchdog, stop
signals (preemption), the doctor, and what FSDP2 sharding changes.
"""
