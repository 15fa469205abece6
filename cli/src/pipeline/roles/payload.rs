//! What an instance sends and what it checks: each request's scalar
//! fields and tensors, staged with patience, forwarded by denoisers, and
//! verified byte by byte by receivers.

use super::*;

pub(super) fn scalars(n: u64) -> String {
    json!({
        "n": n,
        "prompt": "a red fox running through fresh snow at dawn, cinematic",
        "negative_prompt": "",
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
        "seed": 1000 + n,
        "height": 720,
        "width": 1280,
        "num_frames": 81,
        "t_commit_ns": wall_ns(),
    })
    .to_string()
}

/// Stages a request, retrying while the pool or the request table is full
/// (the receivers drain it), for at most `patience`; `while_waiting` runs
/// between tries and says whether to go on trying.
pub(crate) fn stage_with_patience<'n, 'a>(
    node: &'n InstanceNode,
    id: &str,
    specs: &[tensorferry_core::slots::TensorSpec<'a>],
    patience: Duration,
    mut while_waiting: impl FnMut() -> bool,
) -> Result<Staging<'n, 'a>, NodeError> {
    let start = Instant::now();
    loop {
        match node.stage(id, specs) {
            Err(NodeError::Instance(InstanceError::Pool(_) | InstanceError::TableFull))
                if start.elapsed() < patience && while_waiting() => {}
            other => return other,
        }
    }
}

/// A denoiser's hand-off: stages the denoised latents of request `n` under
/// the delivery's id (waiting up to 30 s for room, while `patient` says so)
/// and forwards them with `scalar_fields`, which lets go of the delivery.
/// On an error the delivery is failed.
pub(crate) fn forward_denoised(
    node: &InstanceNode,
    d: Delivery<'_>,
    n: u64,
    scalar_fields: &str,
    patient: &dyn Fn() -> bool,
) -> Result<(), NodeError> {
    let id = d.id().to_owned();
    let specs = data::denoiser_tensors();
    let staged = stage_with_patience(node, &id, &specs, Duration::from_secs(30), || {
        std::thread::sleep(Duration::from_millis(1));
        patient()
    });
    let mut staged = match staged {
        Ok(s) => s,
        Err(e) => {
            d.fail("no room to stage the denoised latents");
            return Err(e);
        }
    };
    if let Some(t) = staged.tensor_mut(0) {
        data::fill_denoised(t, n);
    }
    // The next leg staged and the input let go of at once (one message
    // under sglang's head).
    staged.forward(d, scalar_fields)
}

/// The encoder: sends `requests` requests, at most `window` in flight,
/// until it is asked to stop.
pub(super) fn encode(
    node: &InstanceNode,
    args: &InstanceProcessConfig,
    ending: &mut Ending<'_>,
    tally: &mut Tally,
) -> Result<(), NodeError> {
    let pipeline_specs = data::encoder_tensors();
    let mut dims = [0u64; 1];
    for n in 0..args.requests {
        while (n - tally.sent - tally.send_failed) as usize >= args.window {
            if !ending.taking_work() {
                return Ok(());
            }
            drain_outcomes(node, tally, Duration::from_millis(50));
        }
        if !args.pace.is_zero() {
            ending.sleep(args.pace);
        }
        if !ending.taking_work() {
            return Ok(());
        }
        let id = format!("{}-{n}", args.name);
        let random_spec;
        let specs: &[tensorferry_core::slots::TensorSpec<'_>] = match args.workload {
            // (The sglang workload's encoder runs in `sglang.rs`.)
            Workload::Pipeline | Workload::Sglang => &pipeline_specs,
            Workload::Random { seed, max_bytes } => {
                dims[0] = data::random_size(seed, n, max_bytes);
                random_spec = [data::blob(&dims)];
                &random_spec
            }
        };
        let staging = stage_with_patience(node, &id, specs, Duration::from_secs(60), || {
            drain_outcomes(node, tally, Duration::from_millis(5));
            ending.taking_work()
        });
        let mut staging = match staging {
            Ok(s) => s,
            // Asked to stop while it waited for room.
            Err(NodeError::Instance(InstanceError::Pool(_) | InstanceError::TableFull))
                if !ending.taking_work() =>
            {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for k in 0..specs.len() {
            if let Some(t) = staging.tensor_mut(k) {
                data::fill(t, n, k as u64);
            }
        }
        staging.commit(&scalars(n))?;
        tally.staged += 1;
    }
    // Every request ends, sent or failed.
    while tally.sent + tally.send_failed < args.requests && ending.keep_going() {
        drain_outcomes(node, tally, Duration::from_millis(50));
    }
    emit_json(&json!({
        "event": "encoded",
        "sent": tally.sent,
        "send_failed": tally.send_failed,
        "failures": tally.failures,
    }));
    Ok(())
}

pub(super) fn scalar_u64(scalars: &str, key: &str) -> Option<u64> {
    RawJson::parse_object(scalars)
        .ok()?
        .get(key)?
        .as_str()
        .parse()
        .ok()
}

/// Checks a delivery of request `n` against what its sender made: the
/// field and first byte that differ, if any.
pub(super) fn verify(
    d: &Delivery<'_>,
    n: u64,
    workload: Workload,
    forward: bool,
) -> Option<(String, usize)> {
    let mut bad = None;
    let mut seen = 0;
    for v in d.tensors() {
        seen += 1;
        let at = match (workload, v.field.raw(), forward) {
            (Workload::Random { seed, max_bytes }, _, _) => {
                let want = data::random_size(seed, n, max_bytes);
                if v.bytes.len() as u64 != want {
                    Some(v.bytes.len().min(want as usize))
                } else {
                    data::check(v.bytes, n, 0)
                }
            }
            (_, "prompt_embeds", true) => data::check(v.bytes, n, 0),
            (_, "latents", true) => data::check(v.bytes, n, 1),
            (_, "latents", false) => data::check_denoised(v.bytes, n),
            _ => Some(0),
        };
        if let Some(at) = at {
            bad = Some((v.field.raw().to_owned(), at));
        }
    }
    let tensors = match workload {
        Workload::Pipeline if forward => 2,
        _ => 1,
    };
    if seen != tensors {
        bad = Some(("manifest".to_owned(), 0));
    }
    bad
}
