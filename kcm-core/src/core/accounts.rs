//! Whose a batch job named like gleaner's is, and the account each job's
//! placeholders are submitted as.

use super::*;

impl KcmCore {
    /// A placeholder of `owner`'s whose launcher reached the broker: its
    /// start worked, once (the cluster's failures and its account's are
    /// cleared).
    pub(super) fn credit(&mut self, id: &str, owner: &str) {
        if !self.starts.credited.insert(id.to_owned()) {
            return;
        }
        let failures = self.starts.failures.cluster();
        if failures > 0 {
            info!(
                placeholder = id,
                failures, "a launcher reached the broker: starts work again"
            );
        }
        self.starts.failures.started(Some(owner));
        self.starts.error = None;
    }

    /// The reading with its jobs named like gleaner's judged by their
    /// owners ([`KcmCore::is_gleaners`]): anybody else's is a job like any
    /// other of theirs, which the kcm never removes, withdraws or counts
    /// as a start of its own. Each is logged once: someone may be
    /// impersonating gleaner.
    pub(super) fn judge(&mut self, snapshot: Snapshot) -> Snapshot {
        if !self.adopted {
            self.adopt_accounts(&snapshot.named);
        }
        let mut strangers = BTreeSet::new();
        for named in snapshot.named.iter().filter(|n| !self.is_gleaners(n)) {
            if !named.ids.iter().any(|id| self.strangers.contains(id)) {
                let expected = match named.component {
                    Some(_) => Some(self.config.account.as_str()),
                    None => self.placeholder_account(&named.job),
                };
                warn!(job = %named.job, component = ?named.component, owner = %named.owner, expected = ?expected, batch_ids = ?named.ids, "a batch job named like gleaner's is not gleaner's: counted as a local job");
            }
            strangers.extend(named.ids.iter().cloned());
        }
        self.strangers = strangers;
        snapshot.judge(|named| self.is_gleaners(named))
    }

    /// Whether a job named like gleaner's is: submitted by the account
    /// that submits such jobs — the kcm's own for a grid component, the
    /// job's [`KcmCore::placeholder_account`] for a placeholder.
    pub(super) fn is_gleaners(&self, named: &NamedJob) -> bool {
        let of_the_job = self.placeholder_account(&named.job) == Some(named.owner.as_str());
        match named.component {
            // The kcm's own where it submits components and switches to
            // the owner in their wrapper, the owner's where the batch
            // system runs them as the owner.
            Some(_) => named.owner == self.config.account || of_the_job,
            None => of_the_job,
        }
    }

    /// The account `job`'s placeholders (and, where the batch system runs
    /// them as their owner, its components) are submitted as: with one
    /// user the kcm's own; with many, its owner's, known from its grants
    /// and components (or adopted); `None` for a job the kcm has no
    /// account for.
    /// The account `owner`'s jobs run as: their own (`[users] accounts`
    /// maps broker users to Unix accounts) where users are kept apart, the
    /// kcm's (`None`) with one user.
    pub(super) fn account_of(&self, owner: &str) -> Option<String> {
        let users = &self.config.users;
        (!users.is_single()).then(|| users.account(owner).to_owned())
    }

    pub(super) fn placeholder_account(&self, job: &JobId) -> Option<&str> {
        if self.config.users.is_single() {
            return Some(&self.config.account);
        }
        self.accounts.get(job).map(|account| account.name.as_str())
    }

    /// With many users, at the first reading: the placeholders (and the
    /// components submitted as their owner) of a job the kcm has no
    /// account for (its predecessor's) are adopted if they all have one
    /// owner, which becomes the job's account; if two owners claim one
    /// job, none are, until a grant says whose it is. Later readings adopt
    /// nothing: a kcm learns a job's account before it submits anything
    /// for it, so a batch job of a job it has no account for is not its
    /// own.
    pub(super) fn adopt_accounts(&mut self, named: &[NamedJob]) {
        if self.config.users.is_single() {
            return;
        }
        let mut owners: BTreeMap<&JobId, BTreeSet<&str>> = BTreeMap::new();
        for named in named.iter().filter(|n| {
            !self.accounts.contains_key(&n.job)
                && (n.component.is_none() || n.owner != self.config.account)
        }) {
            owners.entry(&named.job).or_default().insert(&named.owner);
        }
        for (job, owners) in owners {
            match owners.first() {
                Some(owner) if owners.len() == 1 => {
                    let name = (*owner).to_owned();
                    self.accounts
                        .insert(job.clone(), JobAccount { name, ended: false });
                }
                _ => {
                    warn!(job = %job, owners = ?owners, "placeholders of one job by different owners: none adopted until the job's next grant says whose");
                }
            }
        }
    }
}
