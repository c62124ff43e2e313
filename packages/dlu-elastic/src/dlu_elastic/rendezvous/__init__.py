"""Rendezvous of an elastic role: pure round logic (`state`), the gRPC server (`service`) and
the agent's client (`client`). Import the submodule you need: `state` needs neither gRPC nor Ray."""
