//! A coordinator and two instances (encoder, denoiser) through a hand-off
//! over borrowed, stack-placed tables, with no allocator: every table is a
//! slice carved from arrays on this function's stack, each as long as
//! `storage_needed` says; messages cross as bytes (encoded by one machine,
//! decoded by the next), and the encoder's write is a copy between the two
//! pools, checked byte for byte at the receiver.

use tensorferry_core::handshake::coordinator::{
    self, Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStorage, PeerSlot,
};
use tensorferry_core::handshake::instance::{
    self, Instance, InstanceConfig, InstanceEvent, InstanceIdentity, InstanceStorage,
    OutboxStorage, Prealloc, PreallocUse, SlotsStorage, Token, TransfersStorage,
};
use tensorferry_core::handshake::tables::HeapEntry;
use tensorferry_core::handshake::{
    GraveyardSizes, GraveyardStorage, HashKey, HeapStorage, Instant, Limits, RequestsStorage,
    TableSizes, TableStorage, Tombstone,
};
use tensorferry_core::json::RawJson;
use tensorferry_core::managed::ManagedSlice;
use tensorferry_core::slots::BuddyConfig;
use tensorferry_core::transport::Incoming;
use tensorferry_core::wire::{Manifest, PreallocatedSlot, TensorEntry, TRANSFER_MAGIC};

/// The table sizes: four requests in flight, two instances.
const LIMITS: Limits = Limits {
    requests: 4,
    nested_per_request: 512,
    tombstones: 8,
    members: 2,
    prealloc_per_member: 2,
};
const POOL: usize = 64 << 10;
const BLOCK: u64 = 4 << 10;
const LEN: usize = 6 << 10;
const COORD: &str = "inproc://coordinator";
const ENC: &str = "inproc://encoder";
const DEN: &str = "inproc://denoiser";

/// Hands out consecutive slices of one array, each as long as asked.
struct Carve<'a, T>(&'a mut [T]);

impl<'a, T> Carve<'a, T> {
    fn take(&mut self, n: usize) -> Result<ManagedSlice<'a, T>, i32> {
        let rest = core::mem::take(&mut self.0);
        if n > rest.len() {
            return Err(90);
        }
        let (head, tail) = rest.split_at_mut(n);
        self.0 = tail;
        Ok(head.into())
    }
}

/// An instance's arrays of records, sized for `LIMITS` with room to spare
/// (`storage_needed` decides each table's length).
struct InstanceArrays {
    records: [Option<instance::Request>; 16],
    out: [Option<instance::Outgoing>; 64],
    events: [Option<InstanceEvent>; 64],
    prealloc: [PreallocatedSlot; 4],
    uses: [PreallocUse; 4],
    writes: [Option<instance::Write>; 8],
    arrivals: [Option<instance::Arrival>; 8],
    held: [Option<Token>; 16],
}

impl InstanceArrays {
    const fn new() -> Self {
        const NONE: PreallocatedSlot = PreallocatedSlot {
            offset: 0,
            size: 0,
            slot_id: 0,
            addr: 0,
        };
        Self {
            records: [const { None }; 16],
            out: [const { None }; 64],
            events: [const { None }; 64],
            prealloc: [NONE; 4],
            uses: [PreallocUse::FREE; 4],
            writes: [const { None }; 8],
            arrivals: [const { None }; 8],
            held: [const { None }; 16],
        }
    }
}

/// A machine's arrays of numbers and tombstones, carved by `Nums`.
struct Numbers {
    bytes: [u8; 4096],
    words: [u32; 256],
    longs: [u64; 1024],
    heap: [HeapEntry; 256],
    tombstones: [Tombstone; 32],
}

impl Numbers {
    const fn new() -> Self {
        Self {
            bytes: [0; 4096],
            words: [0; 256],
            longs: [0; 1024],
            heap: [(0, 0); 256],
            tombstones: [Tombstone::EMPTY; 32],
        }
    }
}

fn table<'a, T>(
    records: &mut Carve<'a, Option<T>>,
    n: &mut Nums<'a>,
    sizes: TableSizes,
) -> Result<TableStorage<'a, T>, i32> {
    Ok(TableStorage {
        records: records.take(sizes.records)?,
        free: n.words.take(sizes.records)?,
        index: n.longs.take(sizes.index)?,
        hashes: n.longs.take(sizes.records)?,
        timers: n.heap.take(sizes.timers)?,
        timer_places: n.longs.take(sizes.timers)?,
    })
}

fn graveyard<'a>(n: &mut Nums<'a>, sizes: GraveyardSizes) -> Result<GraveyardStorage<'a>, i32> {
    Ok(GraveyardStorage {
        stones: n.tombstones.take(sizes.stones)?,
        index: n.longs.take(sizes.index)?,
    })
}

/// Carvers over a `Numbers`.
struct Nums<'a> {
    bytes: Carve<'a, u8>,
    words: Carve<'a, u32>,
    longs: Carve<'a, u64>,
    heap: Carve<'a, HeapEntry>,
    tombstones: Carve<'a, Tombstone>,
}

impl<'a> Nums<'a> {
    fn of(n: &'a mut Numbers) -> Self {
        Self {
            bytes: Carve(&mut n.bytes),
            words: Carve(&mut n.words),
            longs: Carve(&mut n.longs),
            heap: Carve(&mut n.heap),
            tombstones: Carve(&mut n.tombstones),
        }
    }
}

fn pool_config() -> BuddyConfig {
    BuddyConfig {
        pool_size: POOL as u64,
        min_block: BLOCK,
        pool_id: 0,
    }
}

fn instance_config(prealloc: usize) -> InstanceConfig {
    InstanceConfig {
        min_block: BLOCK,
        prealloc: Prealloc {
            count: prealloc,
            size: 8 << 10,
        },
        ..InstanceConfig::FERRY
    }
}

/// An instance's tables, carved, for `prealloc` preallocated slots.
fn instance_storage<'a>(
    a: &'a mut InstanceArrays,
    n: &mut Nums<'a>,
    prealloc: usize,
) -> Result<InstanceStorage<'a>, i32> {
    let s = InstanceStorage::storage_needed(&LIMITS, &pool_config(), prealloc).map_err(|_| 20)?;
    let (slots, transfers, outbox) = (s.slots, s.transfers, s.outbox);
    Ok(InstanceStorage {
        slots: SlotsStorage {
            tree: n.bytes.take(slots.tree)?,
            generations: n.words.take(slots.generations)?,
            prealloc: Carve(&mut a.prealloc).take(slots.prealloc)?,
            prealloc_use: Carve(&mut a.uses).take(slots.prealloc)?,
            prealloc_index: n.longs.take(slots.prealloc_index)?,
            prealloc_timers: HeapStorage {
                entries: n.heap.take(slots.prealloc)?,
                places: n.longs.take(slots.prealloc)?,
            },
        },
        transfers: TransfersStorage {
            live: RequestsStorage {
                requests: table(&mut Carve(&mut a.records), n, transfers.live.requests)?,
                nested: n.bytes.take(transfers.live.nested)?,
            },
            tombstones: graveyard(n, transfers.tombstones)?,
            arrivals: table(&mut Carve(&mut a.arrivals), n, transfers.arrivals)?,
            landing_index: n.longs.take(transfers.landing_index)?,
            landing_hashes: n.longs.take(transfers.landing_hashes)?,
            held: Carve(&mut a.held).take(transfers.held)?,
        },
        outbox: OutboxStorage {
            transmits: Carve(&mut a.out).take(outbox.transmits)?,
            actions: Carve(&mut a.writes).take(outbox.actions)?,
            events: Carve(&mut a.events).take(outbox.events)?,
        },
        hash_key: HashKey::new(0x1f2e_3d4c_5b6a_7988, 0x0123_4567_89ab_cdef),
    })
}

/// Where a coordinator's message goes: the instance at the endpoint `to`,
/// as a channel delivers it there.
fn deliver_to_instance(
    insts: &mut [&mut Instance<'_>; 2],
    to: &str,
    payload: &[u8],
) -> Result<(), i32> {
    let inst = insts
        .iter_mut()
        .find(|i| i.work_endpoint() == to)
        .ok_or(30)?;
    let msg = Incoming {
        from: COORD,
        via: to,
        user: "",
        magic: TRANSFER_MAGIC,
        payload,
    };
    inst.handle_incoming(Instant(0), &msg).map_err(|_| 32)
}

pub fn check() -> Result<(), i32> {
    let mut coord_nums = Numbers::new();
    let mut cn = Nums::of(&mut coord_nums);
    let s = CoordinatorStorage::storage_needed(&LIMITS);
    let mut members: [Option<coordinator::Member>; 4] = [const { None }; 4];
    let mut transfers: [Option<coordinator::Transfer>; 8] = [const { None }; 8];
    let mut parked: [Option<coordinator::Parked>; 16] = [const { None }; 16];
    let mut out: [Option<coordinator::Outgoing>; 64] = [const { None }; 64];
    let mut events: [Option<CoordinatorEvent>; 64] = [const { None }; 64];
    let mut admitted: [Option<coordinator::Admitted>; 4] = [const { None }; 4];
    let mut peers = [PeerSlot::EMPTY; 128];
    let mut ranking = [(0u64, 0u32); 64];
    let mut transmits = Carve(&mut out);
    let mut queue_events = Carve(&mut events);
    let mut rankings = Carve(&mut ranking);
    let storage = CoordinatorStorage {
        prealloc_per_member: s.prealloc_per_member,
        registry: coordinator::RegistryStorage {
            members: table(&mut Carve(&mut members), &mut cn, s.registry.members)?,
            sessions: cn.longs.take(s.registry.member_index)?,
            endpoints: cn.longs.take(s.registry.member_index)?,
            ranking: HeapStorage {
                entries: rankings.take(s.registry.ranking.entries)?,
                places: cn.longs.take(s.registry.ranking.places)?,
            },
            room_ranking: HeapStorage {
                entries: rankings.take(s.registry.ranking.entries)?,
                places: cn.longs.take(s.registry.ranking.places)?,
            },
        },
        transfers: coordinator::TransfersStorage {
            requests: table(&mut Carve(&mut transfers), &mut cn, s.transfers.requests)?,
            nested: cn.bytes.take(s.transfers.nested)?,
        },
        outbox: coordinator::OutboxStorage {
            transmits: transmits.take(s.outbox.transmits)?,
            events: queue_events.take(s.outbox.events)?,
        },
        remains: coordinator::RemainsStorage {
            parked: table(&mut Carve(&mut parked), &mut cn, s.remains.parked)?,
            finished: graveyard(&mut cn, s.remains.finished)?,
        },
        admitted: Carve(&mut admitted).take(s.admitted)?,
        peers: Carve(&mut peers).take(s.peers)?,
        peer_index: cn.longs.take(s.peer_index)?,
        hash_key: HashKey::new(0x7766_5544_3322_1100, 0x0f1e_2d3c_4b5a_6978),
    };
    let mut coord = Coordinator::new(&["encoder", "denoiser"], CoordinatorConfig::FERRY, storage)
        .map_err(|_| 21)?;

    // The two pools, and each instance's tables.
    let mut enc_pool = [0u8; POOL];
    let mut den_pool = [0u8; POOL];
    let mut enc_nums = Numbers::new();
    let mut den_nums = Numbers::new();
    let mut en = Nums::of(&mut enc_nums);
    let mut dn = Nums::of(&mut den_nums);
    let (mut enc_arrays, mut den_arrays) = (InstanceArrays::new(), InstanceArrays::new());
    let enc_storage = instance_storage(&mut enc_arrays, &mut en, 0)?;
    let den_storage = instance_storage(&mut den_arrays, &mut dn, 2)?;
    let who = |role, session, endpoint, pool: &[u8; POOL]| InstanceIdentity {
        role,
        session_id: session,
        work_endpoint: endpoint,
        coordinator: COORD,
        pool_ptr: pool.as_ptr() as u64,
        pool_size: POOL as u64,
        delivery_complete: true,
        write_lifetime: core::time::Duration::ZERO,
    };
    let enc_who = who("encoder", "s-enc", ENC, &enc_pool);
    let den_who = who("denoiser", "s-den", DEN, &den_pool);
    let den_base = den_pool.as_ptr() as u64;
    let mut enc =
        Instance::new(Instant(0), &enc_who, &instance_config(0), enc_storage).map_err(|_| 22)?;
    let mut den =
        Instance::new(Instant(0), &den_who, &instance_config(2), den_storage).map_err(|_| 23)?;

    let mut buf = [0u8; 2048];
    let mut received = None;
    let mut delivered = false;
    let mut staged = false;
    for round in 0..64 {
        let mut moved = false;
        // The coordinator's messages, to the instance at the endpoint named.
        while let Some(t) = coord.poll_transmit(&mut buf) {
            let t = t.map_err(|_| 40)?;
            moved = true;
            let mut to = [0u8; 64];
            let ep = coord.endpoint_of(t.to).ok_or(41)?;
            let n = ep.len().min(to.len());
            to[..n].copy_from_slice(&ep.as_bytes()[..n]);
            let to = core::str::from_utf8(&to[..n]).map_err(|_| 42)?;
            deliver_to_instance(&mut [&mut enc, &mut den], to, &buf[..t.len])?;
        }
        while let Some(e) = coord.poll_event() {
            delivered |= matches!(e, CoordinatorEvent::Delivered { .. });
        }
        // Each instance's messages, to the coordinator, named by endpoint.
        for inst in [&mut enc, &mut den] {
            while let Some(n) = inst.poll_transmit(&mut buf) {
                let n = n.map_err(|_| 43)?;
                moved = true;
                let msg = Incoming {
                    from: inst.work_endpoint(),
                    via: COORD,
                    user: "",
                    magic: TRANSFER_MAGIC,
                    payload: &buf[..n],
                };
                coord.handle_incoming(Instant(0), &msg).map_err(|_| 44)?;
            }
        }
        // The encoder's writes: copies into the denoiser's pool.
        while let Some(w) = enc.poll_action() {
            moved = true;
            let at = w.dest_addr.checked_sub(den_base).ok_or(50)? as usize;
            let from = w.local_offset as usize;
            let len = w.len as usize;
            if at + len > POOL || from + len > POOL || w.dest_session.as_str() != "s-den" {
                return Err(51);
            }
            den_pool[at..at + len].copy_from_slice(&enc_pool[from..from + len]);
            enc.handle_completion(Instant(0), w.token, Ok(()))
                .map_err(|_| 52)?;
        }
        while let Some(e) = den.poll_event() {
            if let InstanceEvent::Received(t) = e {
                received = Some(t);
            }
        }
        while enc.poll_event().is_some() {}
        // Once both are registered: stage and commit one request.
        if !staged && enc.is_registered() && den.is_registered() {
            let (token, offset) = enc.stage("req-1", LEN as u64).map_err(|_| 60)?;
            for (i, b) in enc_pool[offset as usize..][..LEN].iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31).wrapping_add(7);
            }
            let dims = [LEN as u64];
            let entries = [TensorEntry::single("x", &dims, "uint8")];
            let scalars = RawJson::parse_object(r#"{"prompt":"a red fox"}"#).map_err(|_| 61)?;
            enc.commit(
                Instant(0),
                token,
                LEN as u64,
                &Manifest::Entries(&entries),
                scalars,
            )
            .map_err(|_| 62)?;
            staged = true;
            moved = true;
        }
        // The application at the denoiser: the bytes, then the release.
        if let Some(t) = received.take() {
            let rx = den.received(t).ok_or(70)?;
            let at = rx.slot_offset as usize;
            let ok = den_pool[at..][..LEN]
                .iter()
                .enumerate()
                .all(|(i, b)| *b == (i as u8).wrapping_mul(31).wrapping_add(7));
            if !ok || rx.id != "req-1" {
                return Err(71);
            }
            den.release(t, None).map_err(|_| 72)?;
            moved = true;
        }
        if !moved {
            return if delivered {
                Ok(())
            } else {
                Err(80 + round.min(9))
            };
        }
    }
    Err(89)
}
