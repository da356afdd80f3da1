"""The lab: profiles and `rookworld run`, plots, explorers, performance tools and the `rookworld` CLI."""
