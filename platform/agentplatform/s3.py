"""The S3 client, configured from settings (SeaweedFS locally, any S3 in production)."""

import boto3
from botocore.config import Config
from django.conf import settings


def s3_client():
    return boto3.client(
        "s3",
        endpoint_url=settings.S3_ENDPOINT_URL,
        region_name=settings.S3_REGION,
        aws_access_key_id=settings.AWS_ACCESS_KEY_ID,
        aws_secret_access_key=settings.AWS_SECRET_ACCESS_KEY,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5,
                      read_timeout=30),
    )
