# One image for every inferwatch service (exporters, notifier, triage, generate): `inferwatch <subcommand>`.
# docker-compose.yml builds it once and runs each service with its own command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the package needs (its src/ tree); the test stack (nvidia-pytriton) is not installed: in compose,
# Triton is the official image.
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install . && rm -rf /src

RUN groupadd --system --gid 10001 inferwatch \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/inferwatch --create-home inferwatch
# Numeric, so Kubernetes can verify runAsNonRoot (deploy/kubernetes runs it with runAsUser 10001 and a
# read-only root filesystem: nothing here writes outside /tmp and the notifier's --data-dir).
USER 10001:10001
WORKDIR /var/lib/inferwatch
ENTRYPOINT ["inferwatch"]
CMD ["--help"]
