"""Starting jobs: bpslaunch (one role, a job on this machine, or a job across hosts over
ssh), the per-host agent it runs remotely, and perseusrun."""
