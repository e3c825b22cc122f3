//! The client's bearer token: `authorization: Bearer <token>` on every call
//! of every channel the client opens (marked sensitive, so it is neither
//! logged nor indexed by HTTP/2), for nodes with token keys.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::ClientError;

/// What every call of a client goes over: a node's channel, with the
/// client's bearer token added to each call.
pub(crate) type Transport = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer <token>` to every call, when the client has a token.
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub(crate) fn new(token: Option<&str>) -> Result<Self, ClientError> {
        token
            .map(|token| {
                let mut value: MetadataValue<Ascii> = format!("Bearer {}", token.trim())
                    .parse()
                    .map_err(|_| ClientError::InvalidToken)?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()
            .map(Self)
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
