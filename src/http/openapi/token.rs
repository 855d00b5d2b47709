//! The schema of a fencing token in a JSON body: a string, never a number (JSON numbers lose
//! precision). Every body with a token field refers to it.

use std::borrow::Cow;

use utoipa::{
    openapi::{
        schema::{ObjectBuilder, Schema, Type},
        RefOr,
    },
    PartialSchema, ToSchema,
};

use crate::fence::FencingToken;

impl PartialSchema for FencingToken {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            // A canonical decimal at most 9223372036854775807 (PostgreSQL `bigint`), exactly
            // as `FencingToken::parse` takes it.
            .pattern(Some(super::rules::token_pattern()))
            .max_length(Some(19))
            .description(Some(
                "A fencing token: a canonical decimal in 0..=9223372036854775807, as a string.",
            ))
            .examples(["42"])
            .into()
    }
}

impl ToSchema for FencingToken {
    fn name() -> Cow<'static, str> {
        "FencingToken".into()
    }
}
