# review-bot: webhook server and dispatcher. Build: docker build -t review-bot .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
# The pinned versions first (scripts/lock.sh writes the lock): a layer that changes only with it.
COPY requirements.lock ./
RUN pip install --no-deps -r requirements.lock
COPY pyproject.toml README.md alembic.ini ./
COPY bot ./bot
COPY migrations ./migrations
COPY policies ./policies
# Editable: the package finds migrations/ and policies/ beside it, as in a checkout. --no-deps:
# everything it needs came from the lock, nothing unpinned is resolved here.
RUN pip install --no-deps -e . && pip check \
    && useradd --system --uid 10001 --home-dir /app reviewbot

USER reviewbot
EXPOSE 8080
# `bot serve` migrates the database at start (pass --no-migrate to skip).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status != 200)"
ENTRYPOINT ["bot"]
CMD ["serve", "--role", "all", "--host", "0.0.0.0", "--port", "8080"]
