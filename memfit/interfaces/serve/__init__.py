"""`memfit serve`: a local web app (serve/page.py) and the JSON API behind it (serve/app.py, FastAPI).

Only `memfit serve` imports app.py (fastapi and uvicorn are the optional extra memfit[serve]); requests.py and
uploads.py turn request documents into memfit's own inputs without any web framework.
"""
