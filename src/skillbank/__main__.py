"""``python -m skillbank`` (also what ``accelerate launch -m skillbank run ...`` starts)."""
from skillbank.cli import app

app()
