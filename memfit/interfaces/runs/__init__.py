"""Monitored runs read back (`memfit watch`): read.py reads memfit.monitor/1 JSON lines, growing files
included; detect.py finds growth, imbalance across ranks and fragmentation, with causes and knobs from
memfit/facts/data/run_findings.toml. No torch here."""
