"""The search tracked in MLflow behind the study: ``tracker`` follows a run and writes
``mlflow_runs``' parent and child runs."""
