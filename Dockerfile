# The widget as a web page (memsim app, served by Voila) for a container host or a Hugging Face Space
# (Docker SDK; a Space routes its port 7860). Build: docker build -t memsim . ; run: docker run -p 7860:7860 memsim
# Not built in this project's CI (its machines have no Docker engine): tests/test_app.py checks the command below.
FROM python:3.11-slim
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user PATH=/home/user/.local/bin:$PATH PYTHONUNBUFFERED=1
WORKDIR /home/user/memsim
COPY --chown=user pyproject.toml README.md ./
COPY --chown=user memsim_widget ./memsim_widget
COPY --chown=user js/widget.js js/widget.css ./js/
# The engine, the widget and Voila; no torch (the trace is not offered on the page).
RUN pip install --no-cache-dir --user ".[widget,app]"
EXPOSE 7860
# Inside a container the server must listen on every interface for the host to reach it; outside one,
# memsim app binds 127.0.0.1.
CMD ["memsim", "app", "--host", "0.0.0.0", "--port", "7860"]
