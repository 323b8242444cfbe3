-- pto.args{ {a, "in"}, {b, "in"}, {c, "out"}, scalars = {42} }: a TaskArgs
-- built from a table (docs/lua.md).
return function(pto)
  function pto.args(spec)
    if type(spec) ~= "table" then
      error(("pto.args: expected a table like { {a, \"in\"}, {c, \"out\"}, scalars = {42} } (got %s)")
        :format(type(spec)), 2)
    end
    for k in pairs(spec) do
      if k ~= "scalars" and (math.type(k) ~= "integer" or k < 1 or k > #spec) then
        error(("pto.args: unknown field '%s' (entries are {tensor, tag} pairs and an optional scalars list)")
          :format(tostring(k)), 2)
      end
    end
    local a = pto.TaskArgs()
    for i, entry in ipairs(spec) do
      if pto.is_tensor(entry) then
        a:add_tensor(entry)
      elseif type(entry) == "table" and pto.is_tensor(entry[1]) then
        local ok, err = pcall(a.add_tensor, a, entry[1], entry[2])
        if not ok then error(("pto.args: entry %d: %s"):format(i, err:gsub("^TaskArgs:add_tensor: ", "")), 2) end
      else
        error(("pto.args: entry %d must be a tensor or {tensor, tag} (got %s)"):format(i, type(entry)), 2)
      end
    end
    local scalars = spec.scalars
    if scalars ~= nil then
      if type(scalars) ~= "table" then
        error(("pto.args: scalars must be a list of numbers (got %s)"):format(type(scalars)), 2)
      end
      for i, s in ipairs(scalars) do
        local ok, err = pcall(a.add_scalar, a, s)
        if not ok then error(("pto.args: scalars[%d]: %s"):format(i, err:gsub("^TaskArgs:add_scalar: ", "")), 2) end
      end
    end
    return a
  end
end
