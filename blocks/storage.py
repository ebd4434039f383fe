"""Where durable outputs that must outlive the Prefect database go (the nightly benchmark's
history): a directory on the shared filesystem, or an S3 prefix with its credentials."""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from prefect_aws import AwsCredentials
from pydantic import Field


class StorageLocation(Block):
    _block_type_name = "Storage Location"
    _block_type_slug = "pretrain-storage-location"
    _description = "A shared-filesystem directory or an s3:// prefix for pretrain-pipeline's records."

    url: str = Field(description="A directory on the shared filesystem, or s3://bucket/prefix.")
    aws_credentials: AwsCredentials | None = Field(
        None, description="For s3:// URLs: the credentials (and endpoint, for S3-compatible servers).")

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for ``url``: keys and endpoint from the credentials block."""
        if not self.url.startswith("s3://") or self.aws_credentials is None:
            return {}
        creds = self.aws_credentials
        options: dict[str, Any] = {"key": creds.aws_access_key_id,
                                   "secret": creds.aws_secret_access_key.get_secret_value()
                                   if creds.aws_secret_access_key else None}
        if creds.aws_session_token:
            options["token"] = creds.aws_session_token
        client_kwargs = {k: v for k, v in {"region_name": creds.region_name,
                                           "endpoint_url": creds.aws_client_parameters.endpoint_url}.items() if v}
        if client_kwargs:
            options["client_kwargs"] = client_kwargs
        return options
