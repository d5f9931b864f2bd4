from skillbank.cli import app

app()
