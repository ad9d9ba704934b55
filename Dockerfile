# One image for every pidlease service: the coordinator, the partition server and the CLI.
FROM python:3.11-slim-bookworm
RUN useradd --system --create-home pidlease
WORKDIR /opt/pidlease
COPY pyproject.toml README.md ./
COPY pidlease ./pidlease
COPY coordinator ./coordinator
COPY partition_server ./partition_server
COPY pipeline ./pipeline
RUN pip install --no-cache-dir . uvloop
USER pidlease
ENV PIDLEASE_DATA_DIR=/var/lib/pidlease
CMD ["pidlease", "--help"]
