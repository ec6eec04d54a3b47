//! Removing the objects a deployment no longer wants: the prune phase of a deployment
//! ([`crate::execute::Run::prune`]) and the removal of a deleted one ([`crate::cleanup`]).

use tender_runtime::Executor;
use tender_types::ObjectRef;

use crate::context::Context;
use crate::plan::{self, Owner};
use crate::{Error, Result};

/// Deletes (or, with `keep` or the object's own keep-resources marker, strips tender's
/// metadata from) each object in `objects` that `owner` owns. Manifests go before copies
/// (reverse apply order). Objects already gone or owned by someone else are skipped.
pub(crate) async fn remove_objects(
    ctx: &Context,
    writer: &Executor,
    owner: &Owner,
    objects: &[ObjectRef],
    keep: bool,
) -> Result<()> {
    for key in objects.iter().rev() {
        remove_object(ctx, writer, owner, key, keep).await?;
    }
    Ok(())
}

async fn remove_object(
    ctx: &Context,
    writer: &Executor,
    owner: &Owner,
    r: &ObjectRef,
    keep: bool,
) -> Result<()> {
    let (key, api) = match ctx.down.locate(r).await {
        Ok(x) => x,
        // The kind no longer exists downstream (CRD removed): nothing left to remove.
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e),
    };
    let Some(obj) = api.get_opt(&key.name).await.map_err(|e| {
        Error::kube(
            format!("read {key} downstream for cleanup"),
            key.is_secret(),
            e,
        )
    })?
    else {
        return Ok(());
    };
    let Some((op, action)) = plan::removal_op(key, &obj.metadata, owner, keep) else {
        tracing::debug!(object = %r, "not owned by {}; left alone", owner.annotation());
        return Ok(());
    };
    if writer.execute(op).await?.wrote {
        ctx.metrics.written(action, &r.kind);
    }
    Ok(())
}
