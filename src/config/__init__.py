"""The job's typed config: schemas (registered with Hydra's ConfigStore), sampling params, validation."""
