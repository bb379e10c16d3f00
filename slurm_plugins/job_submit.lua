--[[
nuro's job_submit bridge (Slurm 22.05, job_submit/lua). Admin guide: docs/job_submit.md.

Thin by design: every decision reads the generated policy table nuro_policy.lua (nuro.policy.luatable, written by
`nuro-admin policy apply` beside slurm.conf), and the same rules exist in Python (nuro.policy.admission), checked
against this file by the shared vectors in tests/vectors/admission.json through real sbatch. Change a rule in both.

Per submission: one dofile of the table (slurmctld has no stat() in Lua 5.1, and re-reading keeps `policy apply`
effective at once), then O(1) table lookups. Rules, in order (first failure wins):
  1 account_other_team  2 qos_other_team / qos_no_team  3 tier_denied  4 gpu_cap
  5 pin_changed (modify)  6 pin_invalid  7 pin_team  8 pin_required (only with require_pinning)
  then for team jobs: default QOS g-<team> and account <team>, requeue forced on; for 2..leaf_nodes nodes without
  --switches: req_switch=1 with wait4switch=switch_wait_s (a hint that never blocks longer than that).

Fail operational: without a readable table (missing, syntax error, other format) jobs pass unchanged and each
submission logs an error; Slurm's QOS limits still hold. A Lua runtime error here also lets the job through
(slurmctld ignores the failed call), so the rules are wrapped in pcall to log it with our prefix.

Version notes (22.05.8, src/plugins/job_submit/lua/job_submit_lua.c, src/lua/slurm_lua.c):
  * Debian's plugin links Lua 5.1: `unpack`, not `table.unpack`; no integer subtype (numbers are doubles).
  * slurm.log_user is string.format(...): always pass "%s", msg so a '%' in a name cannot break it.
  * log_user in slurm_job_modify is discarded (an error in slurmctld's log; works from 23.02): scontrol update users
    see only the code's text, e.g. "Access/permission denied"; our log_info line has the reason.
  * unset numbers are NO_VAL / NO_VAL16; "gres" is an alias of tres_per_node (read only if tres_per_node is nil).
  * only a few ESLURM_* codes are exported to Lua (no ESLURM_INVALID_QOS); the table names the one per rule.
  * the script is reloaded when its mtime (1 s resolution) is newer than the loaded copy's.
]]

local TABLE_FILE = "nuro_policy.lua"
local TABLE_FORMAT = 1
-- slurmctld loads us with luaL_loadfile(<dir of slurm.conf>/job_submit.lua): our chunk name is "@<that path>".
local TABLE_PATH = ((debug.getinfo(1, "S").source or ""):match("^@(.*/)[^/]*$") or "./") .. TABLE_FILE

local function load_policy()
	local ok, P = pcall(dofile, TABLE_PATH)
	if not ok then
		return nil, tostring(P)
	end
	if type(P) ~= "table" or P.format ~= TABLE_FORMAT then
		return nil, "format is " .. tostring(type(P) == "table" and P.format) .. ", this script reads " .. TABLE_FORMAT
	end
	return P
end

-- A number field that was given, or nil for Slurm's "unset" markers.
local function given(v)
	if type(v) ~= "number" or v == slurm.NO_VAL or v == slurm.NO_VAL16 or v == slurm.INFINITE then
		return nil
	end
	return v
end

-- GPUs in a TRES list: "gres:gpu:8", "gpu:a100:2", "gres:gpu:2,gres:mps:100" (no count = 1). Mirrors gpu_count().
local function gpus_in(spec)
	local n = 0
	for item in string.gmatch(spec or "", "[^,]+") do
		local name, rest = item:gsub("^gres[:/]", ""):match("^([^:=]+)(.*)$")
		if name == "gpu" then
			n = n + (tonumber(rest:match("[:=](%d+)$")) or 1)
		end
	end
	return n
end

-- The nuro record in a job comment, read WITHOUT a JSON parser: anchored patterns over the compact, sorted JSON nuro
-- writes (nuro.render.comment_json). The skeleton blanks escapes ("~~") and brackets inside strings ("~") at equal
-- length, so %b{} sees only the structure and a key can only match where it is a key: inside a JSON string every '"'
-- follows a backslash. A key must appear once, directly in its object; anything else is not a pin. Returns nil when
-- the comment has no "nuro" key, else { raw = '"nuro":{...}' as sent, bad = first invalid field (P.pin_fields), team,
-- digest, name, commit }. Mirrored by nuro.policy.admission.read_nuro; the shared vectors hold both to it.
local HEX40 = string.rep("[0-9a-f]", 40)
local DIGEST, COMMIT = "^sha256:" .. HEX40 .. string.rep("[0-9a-f]", 24) .. "$", "^" .. HEX40 .. "$"

local function member(obj, key) -- (first, last) of the value of "key": directly in the skeleton object obj
	local k = '"' .. key .. '":'
	local at = obj:find(k, 1, true)
	if not at or obj:find(k, at + 1, true) or obj:sub(2, at - 1):gsub("%b{}", ""):gsub("%b[]", ""):find("[{%[]") then
		return nil
	end
	local i, j = obj:find("^%b{}", at + #k)
	if not i then
		i, j = obj:find('^"[^"]*"', at + #k)
	end
	return i, j
end

local function read_nuro(c)
	if type(c) ~= "string" or not c:find('"nuro":', 1, true) then
		return nil
	end
	local s = c:gsub("\\.", "~~"):gsub('"[^"]*"', function(q)
		return (q:gsub("[{}%[%]]", "~"))
	end)
	local i, j
	if s:find("^%b{}$") then
		i, j = member(s, "nuro")
	end
	if not i or s:sub(i, i) ~= "{" then
		return { raw = c, bad = "nuro" }
	end
	local n = s:sub(i, j)
	local rec = { raw = c:sub(i - 7, j) }
	local function str(obj, key)
		local a, b = member(obj or "", key)
		return a and obj:sub(a, b):match('^"([^"]*)"$')
	end
	local a, b = member(n, "dataset")
	rec.digest, rec.name = (a and n:sub(a, b) or ""):match('^{"digest":"([^"]*)","name":"([^"]*)"}$')
	a, b = member(n, "code")
	rec.commit = str(a and n:sub(a, b):match("^{.*}$"), "commit")
	rec.team = str(n, "team")
	if not rec.digest then
		rec.bad = "nuro.dataset"
	elseif not rec.digest:find(DIGEST) then
		rec.bad = "nuro.dataset.digest"
	elseif #rec.name > 63 or not rec.name:find("^[a-z0-9][a-z0-9._%-]*$") then
		rec.bad = "nuro.dataset.name"
	elseif not (rec.commit and rec.commit:find(COMMIT)) then
		rec.bad = "nuro.code.commit"
	elseif not rec.team or #rec.team > 31 or not rec.team:find("^[a-z][a-z0-9_]*$") then
		rec.bad = "nuro.team"
	end
	return rec
end

-- A field of the update d, else of the job record r (nil at submit).
local function field(d, r, k)
	local v = d[k]
	if v == nil and r then
		v = r[k]
	end
	return v
end

-- GPUs the job asks for, from every field they can arrive in (d: the request or update, r: the job record or nil).
local function gpus_of(d, r)
	-- A node count in the update (NumNodes=) replaces the record's; the upper end counts.
	local nodes = given(d.max_nodes) or given(d.min_nodes) or (r and (given(r.max_nodes) or given(r.min_nodes)))
	nodes = math.max(nodes or 1, 1)
	local tasks = given(d.num_tasks) or (given(d.ntasks_per_node) and given(d.ntasks_per_node) * nodes) or nodes
	local per_node = field(d, r, "tres_per_node") or field(d, r, "gres")
	return math.max(
		gpus_in(field(d, r, "tres_per_job")),
		gpus_in(per_node) * nodes,
		gpus_in(field(d, r, "tres_per_task")) * tasks,
		gpus_in(field(d, r, "tres_per_socket")) * (given(d.sockets_per_node) or 1) * nodes
	), nodes
end

-- The job as the rules see it. On modify (r = job record) unchanged fields come from the record; the user is the
-- modifier when they own the job (job records carry no user name in 22.05), else unknown (nil).
local function view(P, d, r, uid)
	local function str(k)
		return field(d, r, k)
	end
	local function num(k)
		return given(d[k]) or (r and given(r[k]))
	end
	local j = { account = str("account"), qos = str("qos"), switches = num("req_switch") }
	if not r or d.user_id == r.user_id then
		j.user = d.user_name
	end
	j.label = r and ("job_id=" .. tostring(r.job_id)) or ("job=" .. tostring(d.name))
	j.uid = uid
	local own = j.user and P.users[j.user]
	if j.account then
		j.team = P.teams[j.account] and j.account or nil
	else
		j.team = own
	end
	j.own_team = own
	j.gpus, j.nodes = gpus_of(d, r)
	j.rec = read_nuro(str("comment"))
	if r then -- modify: what the job had before this update
		j.old_rec, j.old_gpus = read_nuro(r.comment), gpus_of({}, r)
	end
	return j
end

local function reject(P, rule, ...)
	local r = P.rules[rule]
	return slurm[r.code] or slurm.ESLURM_ACCESS_DENIED, rule, string.format(r.message, ...)
end

-- Rule 1: a team member may not charge another team's account.
local function check_account(P, j)
	if j.own_team and j.account and j.account ~= j.own_team and P.teams[j.account] then
		return reject(P, "account_other_team", j.user, j.own_team, j.account, j.own_team)
	end
end

-- Rule 2: g-<team> / b-<team> only for that team's jobs.
local function check_qos_team(P, j)
	local owner = j.qos and P.qos_team[j.qos]
	if owner and owner ~= j.team then
		if j.team then
			local default = P.teams[j.team].guaranteed_qos
			return reject(P, "qos_other_team", j.qos, owner, j.team, j.team, default)
		end
		local who = j.user or ("uid " .. tostring(j.uid))
		return reject(P, "qos_no_team", j.qos, owner, who, who, owner)
	end
end

-- Rule 3: tier QOS (urgent, ...) only for the listed accounts or users.
local function check_tier(P, j)
	local tier = j.qos and P.tiers[j.qos]
	local account = j.account or j.team
	if tier and not ((j.user and tier.users[j.user]) or (account and tier.accounts[account])) then
		local acct_text = account and ("account " .. account) or "no account given"
		local who = j.user or ("uid " .. tostring(j.uid))
		return reject(P, "tier_denied", j.qos, tier.who, who, acct_text, j.qos, j.qos)
	end
end

-- Rule 4: never more GPUs in one job than the team's quota + borrowing limit.
local function check_gpus(P, j)
	local t = j.team and P.teams[j.team]
	if t and j.gpus > t.max_gpus then
		return reject(P, "gpu_cap", j.team, t.max_gpus, t.quota_gpus, t.borrow_limit_gpus, j.gpus)
	end
end

-- Rules 5-8: the nuro record (pins) in the comment. A record must be valid and for the job's team even when pinning
-- is not required; on modify it can never change (only the channel keys beside it); with require_pinning a team job
-- that asks for GPUs needs one (on modify: when the update raises its GPUs, so a CPU job cannot become a GPU job).
local function check_pins(P, j)
	local rec = j.rec
	if not P.pin_fields then -- a table written before these rules (same format: the keys were only added)
		return
	end
	if j.old_rec and (not rec or rec.raw ~= j.old_rec.raw) then
		return reject(P, "pin_changed")
	end
	if rec and rec.bad then
		return reject(P, "pin_invalid", rec.bad, P.pin_fields[rec.bad], j.team or "<team>")
	end
	local charged = j.account or j.team
	if rec and rec.team ~= charged then
		local text = charged and ("account " .. charged) or "your default account, which is no team"
		return reject(P, "pin_team", rec.team, text, rec.team)
	end
	if P.require_pinning and not rec and j.team and j.gpus > 0 and (j.old_gpus or 0) < j.gpus then
		return reject(P, "pin_required", j.team, j.team)
	end
end

local CHECKS = { check_account, check_qos_team, check_tier, check_gpus, check_pins }

-- Team jobs are always requeueable (preemption and failure recovery requeue them). On modify: only a change to 0.
local function force_requeue(d, j, modifying)
	if j.team and d.requeue ~= 1 and not (modifying and given(d.requeue) == nil) then
		d.requeue = 1
		return "requeue=1"
	end
end

-- Evaluate the checks, then (submit only) apply the team defaults and the switch hint.
local function admit(P, d, j, modifying)
	for _, check in ipairs(CHECKS) do
		local code, rule, msg = check(P, j)
		if code then
			if not modifying then
				slurm.log_user("%s", msg)
			end
			slurm.log_info("nuro: reject %s uid=%s user=%s rule=%s code=%s policy=%s: %s", j.label, tostring(j.uid),
				tostring(j.user), rule, P.rules[rule].code, string.sub(P.digest, 8, 19), msg)
			return code
		end
	end
	local changes = {}
	if j.team and not modifying then
		if not j.qos then
			d.qos = P.teams[j.team].guaranteed_qos
			table.insert(changes, "qos=" .. d.qos)
		end
		if not j.account then
			d.account = j.team
			table.insert(changes, "account=" .. j.team)
		end
	end
	local requeue = force_requeue(d, j, modifying)
	if requeue then
		table.insert(changes, requeue)
	end
	if not modifying and not j.switches and j.nodes >= 2 and j.nodes <= P.leaf_nodes then
		d.req_switch = 1
		d.wait4switch = P.switch_wait_s
		table.insert(changes, "switches=1@" .. P.switch_wait_s .. "s")
	end
	slurm.log_debug("nuro: accept %s uid=%s user=%s team=%s gpus=%d set=%s", j.label, tostring(j.uid),
		tostring(j.user), tostring(j.team), j.gpus, table.concat(changes, ","))
	return slurm.SUCCESS
end

local function run(hook, d, r, uid)
	-- Root (admins, nuro-controller moving jobs between QOS) is let through first, as Slurm's example does: never
	-- locked out by a bad table. Trade-off: a job submitted as root is not judged, so reproduce user errors as
	-- the user (runuser -u <user> -- sbatch ...), not as root.
	if uid == 0 then
		return slurm.SUCCESS
	end
	local P, err = load_policy()
	if not P then
		slurm.log_error("nuro: %s uid=%s: no usable policy table %s (%s); job passes unchanged", hook,
			tostring(uid), TABLE_PATH, err)
		return slurm.SUCCESS
	end
	local ok, rc = pcall(function()
		return admit(P, d, view(P, d, r, uid), r ~= nil)
	end)
	if not ok then
		slurm.log_error("nuro: %s uid=%s: internal error, job passes unchanged: %s", hook, tostring(uid), tostring(rc))
		return slurm.SUCCESS
	end
	return rc
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	return run("submit", job_desc, nil, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return run("modify", job_desc, job_rec, modify_uid)
end

slurm.log_info("nuro: job_submit.lua loaded; policy table %s", TABLE_PATH)
return slurm.SUCCESS
