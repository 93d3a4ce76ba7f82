"""Domain services: business rules over repositories. They take a session and never commit;
``controlplane.api.ControlPlane`` owns the transaction around each call."""
