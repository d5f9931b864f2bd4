"""``python -m skillbank`` (also what ``accelerate launch -m skillbank exp run ...`` starts)."""
from skillbank.cli import app

app()
