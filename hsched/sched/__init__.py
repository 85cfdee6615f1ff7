"""The scheduling core: pure policies and the scheduling round, shared by the controller and the simulator."""
