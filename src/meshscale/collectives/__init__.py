"""meshscale collectives layer: one record per collective (`kinds`), the schedule format (`schedule`), the
algorithms (`algorithms`), topology-aware synthesis of rings and trees (`synthesis`), bounds (`bounds`)."""
