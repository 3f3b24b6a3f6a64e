"""The S3 client, configured from settings (SeaweedFS locally, any S3 in production)."""

import boto3
from botocore.config import Config
from django.conf import settings


def s3_client(*, max_pool_connections: int = 10):
    """A new client. Clients are thread-safe once made (boto3 sessions are not): code with many
    requests to make, from one thread or several, makes one and shares it."""
    return boto3.client(
        "s3",
        endpoint_url=settings.S3_ENDPOINT_URL,
        region_name=settings.S3_REGION,
        aws_access_key_id=settings.AWS_ACCESS_KEY_ID,
        aws_secret_access_key=settings.AWS_SECRET_ACCESS_KEY,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5,
                      read_timeout=30, max_pool_connections=max_pool_connections),
    )
