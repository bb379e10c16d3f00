--[[
nuro's job_submit bridge (Lua 5.1: Debian's slurmctld links liblua5.1).

For now a pass-through: every job is accepted unchanged. The teams work replaces the body with thin rules driven
by a generated policy table (dofile, re-read per submission), checked against the Python preview by shared vectors.
Rules are small functions called from both slurm_job_submit and slurm_job_modify so `scontrol update` cannot
bypass them.
]]

local log_prefix = "nuro/job_submit"

function slurm_job_submit(job_desc, part_list, submit_uid)
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

slurm.log_debug("%s: loaded (pass-through)", log_prefix)
return slurm.SUCCESS
