//! The `Idempotent-Replayed` response header in the document: declared on the 2xx answers of
//! every operation that takes an `Idempotency-Key` (the parameter `params` describes for the
//! `IdemKey` extractor). Derived from the parameters, so a keyed route cannot be added without
//! it, and a route without the key never claims it.

use utoipa::openapi::{
    header::HeaderBuilder,
    path::ParameterIn,
    schema::{ObjectBuilder, Type},
    OpenApi, RefOr,
};

/// The header as the document spells it (the server sends it lowercase, as HTTP/2 must).
const REPLAYED: &str = "Idempotent-Replayed";

pub fn describe_replays(doc: &mut OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            let keyed = operation.parameters.iter().flatten().any(|p| {
                p.parameter_in == ParameterIn::Header
                    && p.name
                        .eq_ignore_ascii_case(crate::http::idempotency::KEY_HEADER)
            });
            if !keyed {
                continue;
            }
            for (status, response) in operation.responses.responses.iter_mut() {
                let RefOr::T(response) = response else {
                    continue;
                };
                if !status.starts_with('2') {
                    continue;
                }
                let header = HeaderBuilder::new()
                    .schema(
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .enum_values(Some(["true"])),
                    )
                    .description(Some(
                        "Present (\"true\") when this answer is the kept outcome of an earlier \
                         request with the same Idempotency-Key: the write landed then, and \
                         nothing was written now.",
                    ))
                    .build();
                response.headers.insert(REPLAYED.into(), header);
            }
        }
    }
}
