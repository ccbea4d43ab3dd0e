"""The federated simulation: clients, their state store, the Fabric round loop."""
